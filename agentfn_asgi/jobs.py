"""The app's side of worker tools: jobs, completion tokens, ``POST {mount}/calls/complete``.

A tool registered with ``enqueue=`` does not run in the web process. Once its arguments are
validated, the dispatcher asks :class:`WorkerJobs` to hand the call off: it builds a
:class:`~agentfn_asgi.calls.records.Job` carrying a signed completion token and gives it to the
tool's ``enqueue`` callable (sync or async: a Celery/RQ/arq task's ``delay``, a Redis
``LPUSH``, an HTTP POST to a worker); the dispatcher then extends the call's claim to the
job's deadline and moves on. A worker runs the handler wherever it likes
(:mod:`agentfn_asgi.worker` is its side) and completes the call::

    POST {mount}/calls/complete
    Authorization: Bearer <job.completion_token>
    Content-Type: application/json

    {"success": true, "output": <any JSON>}   or   {"success": false, "error": "<text>"}

From there the result follows the in-process path: saved durably (the first result saved
wins), submitted with the stable idempotency key, stale handling, recovery.

The completion token (:class:`CompletionTokens`) is an itsdangerous signature over the ids of
exactly one call (session, turn, call), the tool name and the claim's owner, expiring at
the job's deadline. It carries no secret: anyone can read it, nobody can forge or alter it
without ``AGENTFN_COMPLETION_SECRET`` (a secret of its own, never the webhook secret).

A token is also bound to the app that minted it: the store namespace and the mount (the
path of ``AGENTFN_PUBLIC_URL``) are part of the signature's salt. Two apps sharing one
completion secret (two projects in one service, one store) refuse each other's tokens with
401, so a worker that posts to the wrong app can never complete, submit or mark stale a
call of the other project. Every replica, and the CLI's ``recover`` and ``calls settle``,
read the same namespace and public URL, so they mint tokens the app accepts. Changing the
namespace or the public URL's path refuses the tokens of jobs still outstanding.

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
body larger than 8 MiB                                     413
store unavailable, shutting down                           503     (retry later)
========================================================  ======  ==========================

Job deadline policy: while a job is outstanding its claim's lease is the job deadline, so no
replica re-runs it. When the lease expires with no result, the call fails with
:data:`~agentfn_asgi.results.JOB_DEADLINE_MESSAGE` (the job is *not* queued again: it may
still be running). Only when the claim expired before the deadline could have passed (the
web process crashed between claiming the call and queueing its job) is the call treated like
any in-doubt call: queued again for a plain tool, reconciled for a side-effect tool.
"""

from __future__ import annotations

import json
import logging
import math
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from itsdangerous import BadData, URLSafeTimedSerializer
from itsdangerous.timed import TimestampSigner
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import Receive, Scope, Send

from ._asgi import BodyTooLargeError, DisconnectedError, read_body, send_json
from ._threads import ThreadPool
from .calls.records import CallKey, Completion, Job
from .dispatch import Dispatcher
from .errors import CompletionTokenError, CompletionTokenExpiredError, ConfigurationError
from .running import call_either
from .signing import parse_secrets
from .tools import FunctionTool, FunctionTools, ToolContext
from .tracing.spans import call_parent_context

__all__ = [
    "CLOCK_SKEW",
    "COMPLETE_PATH",
    "COMPLETION_BODY_LIMIT",
    "DEFAULT_TOKEN_MAX_AGE",
    "MAX_TOKEN_LENGTH",
    "MIN_SECRET_LENGTH",
    "TOKEN_SALT",
    "CompletionTokens",
    "TokenClaims",
    "WorkerJobs",
    "bearer_token",
    "build_job",
    "call_enqueue",
    "mount_of",
    "parse_completion",
    "worker_jobs",
]

logger = logging.getLogger("agentfn_asgi.jobs")

#: Where the completion endpoint lives below the webhook mount.
COMPLETE_PATH = "/calls/complete"
#: Completion bodies may exceed the webhook cap: a result may be up to 4 MiB, JSON-escaped.
COMPLETION_BODY_LIMIT = 8 * 1024 * 1024
#: Separates these signatures from any other use of the same secret (not a secret itself).
TOKEN_SALT = "agentfn-completion"  # noqa: S105
#: Hard cap on any token's life, whatever the job deadline (defence in depth).
DEFAULT_TOKEN_MAX_AGE = 7 * 86400.0
MIN_SECRET_LENGTH = 16
#: Accepted difference between the clocks of the replica that issued and the one verifying.
CLOCK_SKEW = 300.0
#: Far longer than any token this module issues; refuses junk before decoding it.
MAX_TOKEN_LENGTH = 4096


_W3C = TraceContextTextMapPropagator()


# -- tokens --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TokenClaims:
    """What a verified completion token says: the one call it completes."""

    session_id: str
    turn_id: str
    call_id: str
    owner: str
    tool_name: str
    expires_at: float
    #: The claim's attempt the job was handed off in: a completion is saved only while that
    #: attempt holds the call (fencing).
    attempt: int

    @property
    def key(self) -> CallKey:
        """The call this token is bound to."""
        return CallKey(self.session_id, self.turn_id, self.call_id)


class _ClockedSigner(TimestampSigner):
    """itsdangerous' timestamp signer reading an injected clock (tests, shared time)."""

    def __init__(self, *args: Any, clock: Callable[[], float] = time.time, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clock = clock

    def get_timestamp(self) -> int:
        return int(self._clock())


class CompletionTokens:
    """Issue and verify the signed, expiring token that lets a worker complete one call.

    Args:
        secrets: one secret, or several for a rotation (a list, or one string separated by
            spaces or commas), **newest last**: tokens are signed with the last one and
            verified against all. Each must be at least 16 characters; generate one with
            ``python -c "import secrets; print(secrets.token_urlsafe(32))"``.
        namespace: the store namespace of the app the tokens complete calls in.
        mount: the path the app is mounted at (see :func:`mount_of`); with ``namespace``
            it binds the tokens to one app: another app refuses them, whatever its secret.
        max_age: a cap on any token's life in seconds, whatever the job deadline.
        clock: Unix time source (tests inject one; replicas should share real time).
    """

    def __init__(
        self,
        secrets: str | Sequence[str],
        *,
        namespace: str = "",
        mount: str = "",
        max_age: float = DEFAULT_TOKEN_MAX_AGE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        keys = parse_secrets(secrets, what="completion secrets")
        if not keys:
            raise ConfigurationError(
                "no completion secret: pass completion_secret= or set AGENTFN_COMPLETION_SECRET"
            )
        if any(len(key) < MIN_SECRET_LENGTH for key in keys):
            raise ConfigurationError(
                f"completion secrets must be at least {MIN_SECRET_LENGTH} characters long"
            )
        if not (isinstance(max_age, int | float) and math.isfinite(max_age) and max_age > 0):
            raise ConfigurationError("max_age must be a positive number of seconds")
        self.max_age = float(max_age)
        self._clock = clock
        self._serializer = URLSafeTimedSerializer(
            keys,
            salt=_salt(namespace, mount),
            signer=_ClockedSigner,
            signer_kwargs={"clock": clock},
        )

    def issue(
        self,
        key: CallKey,
        *,
        owner: str,
        tool_name: str,
        attempt: int,
        expires_at: float | None = None,
    ) -> str:
        """A token completing ``key`` only, valid until ``expires_at`` (capped by max_age),
        for the claim ``(owner, attempt)`` that handed the job off."""
        limit = self._clock() + self.max_age
        expiry = limit if expires_at is None else min(expires_at, limit)
        payload = {
            "s": key.session_id,
            "t": key.turn_id,
            "c": key.call_id,
            "o": owner,
            "n": tool_name,
            "x": round(expiry, 3),
            "a": attempt,
        }
        return self._serializer.dumps(payload)

    def verify(self, token: str) -> TokenClaims:
        """The claims of an authentic, unexpired token.

        Raises CompletionTokenExpiredError for an authentic token past its expiry, and
        CompletionTokenError for anything else (forged, altered, another secret or salt,
        malformed), for any input.
        """
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_LENGTH:
            raise CompletionTokenError("malformed completion token")
        try:
            payload, signed_at = self._serializer.loads(token, return_timestamp=True)
        except (BadData, ValueError, TypeError) as exc:
            raise CompletionTokenError("completion token is not authentic") from exc
        claims = _claims_from(payload)
        now = self._clock()
        age = now - signed_at.timestamp()
        if age < -CLOCK_SKEW:
            raise CompletionTokenError("completion token was issued in the future")
        if age > self.max_age or now > claims.expires_at:
            raise CompletionTokenExpiredError("completion token has expired")
        return claims


def _salt(namespace: str, mount: str) -> str:
    # JSON keeps the pair unambiguous whatever characters a namespace or path holds.
    return TOKEN_SALT + ":" + json.dumps([namespace, mount], ensure_ascii=True)


def mount_of(public_url: str | None) -> str:
    """The mount path in ``public_url`` (``https://api.example.com/openai/a/`` →
    ``/openai/a``); ``""`` without one. Only the path binds tokens: moving the app to another
    host or scheme keeps the tokens of outstanding jobs valid."""
    if not public_url:
        return ""
    return urllib.parse.urlsplit(public_url.strip()).path.rstrip("/")


def bearer_token(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The token of an ASGI request's ``Authorization: Bearer <token>`` header, if any."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def _claims_from(payload: object) -> TokenClaims:
    if not isinstance(payload, dict):
        raise CompletionTokenError("completion token payload is not an object")
    texts = [payload.get(name) for name in ("s", "t", "c", "o", "n")]
    expiry = payload.get("x")
    if isinstance(expiry, bool) or not isinstance(expiry, int | float):
        raise CompletionTokenError("completion token payload has no expiry")
    if not all(isinstance(text, str) and text for text in texts):
        raise CompletionTokenError("completion token payload is incomplete")
    s, t, c, o, n = cast(list[str], texts)
    attempt = payload.get("a")
    if isinstance(attempt, bool) or not isinstance(attempt, int):
        raise CompletionTokenError("completion token payload has no attempt")
    return TokenClaims(s, t, c, o, n, float(expiry), attempt)


# -- handing jobs off ------------------------------------------------------------------------


def _trace_headers(key: CallKey) -> tuple[str, str]:
    """W3C headers of the current span, or of the call's virtual parent span when there is
    none, so a worker's span always lands in the call's trace (see tracing.py)."""
    ctx = otel_context.get_current()
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        ctx = call_parent_context(key.session_id, key.call_id)
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=ctx)
    return carrier.get("traceparent", ""), carrier.get("tracestate", "")


def build_job(
    key: CallKey,
    tool: FunctionTool,
    arguments: Mapping[str, Any],
    *,
    tokens: CompletionTokens,
    owner: str,
    attempt: int,
    idempotency_key: str,
    now: float,
    complete_url: str | None = None,
) -> Job:
    """The job for one validated call (what :class:`WorkerJobs` hands to ``enqueue``)."""
    deadline = now + tool.job_deadline
    traceparent, tracestate = _trace_headers(key)
    return Job(
        session_id=key.session_id,
        turn_id=key.turn_id,
        call_id=key.call_id,
        tool_name=tool.name,
        arguments=tool.dump_arguments(arguments),
        idempotency_key=idempotency_key,
        completion_token=tokens.issue(
            key, owner=owner, tool_name=tool.name, expires_at=deadline, attempt=attempt
        ),
        deadline=deadline,
        attempt=attempt,
        complete_url=complete_url,
        traceparent=traceparent,
        tracestate=tracestate,
    )


async def call_enqueue(
    enqueue: Callable[[Job], Any], job: Job, *, threads: ThreadPool | None = None
) -> None:
    """Hand ``job`` to ``enqueue``: an async callable is awaited on the loop; a sync one runs
    in the thread pool like a sync handler (its broker I/O must not block the loop), and an
    awaitable it returns is awaited. Use an async callable for loop-bound objects such as
    an ``asyncio.Queue`` or a ``redis.asyncio`` client. The caller bounds the time."""
    await call_either(enqueue, job, threads=threads)


class WorkerJobs:
    """The app's worker lane: hands calls off as jobs (the dispatcher's
    :class:`~agentfn_asgi.dispatch.execution.JobHandoff`) and takes completions back.

    ``complete_url`` (``{public_url}/calls/complete``) goes into each job when known.
    """

    def __init__(
        self,
        tokens: CompletionTokens,
        *,
        complete_url: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.tokens = tokens
        self.complete_url = complete_url
        self._clock = clock

    async def hand_off(
        self,
        key: CallKey,
        tool: FunctionTool,
        arguments: dict[str, Any],
        context: ToolContext,
        *,
        owner: str,
        threads: ThreadPool | None,
    ) -> None:
        """Build the call's job and give it to the tool's ``enqueue`` callable."""
        assert tool.enqueue is not None
        job = build_job(
            key,
            tool,
            arguments,
            tokens=self.tokens,
            owner=owner,
            attempt=context.attempt,
            idempotency_key=context.idempotency_key,
            now=self._clock(),
            complete_url=self.complete_url,
        )
        await call_enqueue(tool.enqueue, job, threads=threads)

    async def complete(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        dispatcher: Dispatcher,
        ready: Callable[[], Awaitable[None]],
        body_limit: int = COMPLETION_BODY_LIMIT,
        body_timeout: float = 10.0,
    ) -> None:
        """Serve ``POST {mount}/calls/complete``: the token first (nothing is read for a
        stranger), then the body, then ``ready()`` (the app's lazy start) and the save; the
        answers are in the module docstring."""
        refused = 'Bearer error="invalid_token"'
        try:
            claims = self.tokens.verify(bearer_token(scope.get("headers", ())) or "")
        except CompletionTokenExpiredError:
            await send_json(send, 401, {"error": "token_expired"}, www_authenticate=refused)
            return
        except CompletionTokenError:
            await send_json(send, 401, {"error": "invalid_token"}, www_authenticate=refused)
            return
        try:
            body = await read_body(receive, scope, limit=body_limit, timeout=body_timeout)
            completion = parse_completion(body)
        except BodyTooLargeError:
            await send_json(send, 413, {"error": "body too large"})
            return
        except TimeoutError:
            await send_json(send, 408, {"error": "body not received in time"})
            return
        except DisconnectedError:
            return
        except ValueError as exc:
            await send_json(send, 400, {"error": "invalid_body", "message": str(exc)})
            return
        try:
            await ready()
            status = await dispatcher.complete(
                claims.key,
                owner=claims.owner,
                attempt=claims.attempt,
                tool_name=claims.tool_name,
                success=completion.success,
                output=completion.output,
                error=completion.error,
            )
        except LookupError:  # the token names another tool than its call
            await send_json(send, 401, {"error": "invalid_token"}, www_authenticate=refused)
            return
        except Exception:
            # Store down or a bug: never a 500; the worker retries (a repeat is harmless).
            logger.exception("could not record the completion of %s", claims.key)
            await send_json(send, 503, {"error": "temporarily unavailable"}, retry_after="5")
            return
        if status == "conflict":
            await send_json(send, 409, {"error": "conflict", "status": status})
        elif status == "unknown_tool":
            await send_json(send, 404, {"error": "unknown_tool", "status": status})
        else:
            await send_json(send, 200, {"status": status})


def worker_jobs(
    tools: FunctionTools,
    secrets: Sequence[str],
    *,
    public_url: str | None = None,
    namespace: str = "",
    clock: Callable[[], float] = time.time,
) -> WorkerJobs | None:
    """The worker lane of an app (or of ``agentfn-asgi recover``) when ``secrets`` are given,
    else None; its tokens are bound to ``namespace`` (the store's) and the path of
    ``public_url``. Raises ConfigurationError when a tool enqueues jobs but no secret is set."""
    queued = sorted(tool.name for tool in tools if tool.enqueue is not None)
    if not secrets:
        if queued:
            raise ConfigurationError(
                f"tools {queued} hand calls to workers but no completion secret is set: pass "
                "completion_secret= or set AGENTFN_COMPLETION_SECRET (a random string of 16+ "
                "characters, not the webhook secret)"
            )
        return None
    complete_url = public_url.rstrip("/") + COMPLETE_PATH if public_url else None
    tokens = CompletionTokens(secrets, namespace=namespace, mount=mount_of(public_url), clock=clock)
    return WorkerJobs(tokens, complete_url=complete_url, clock=clock)


# -- completion bodies -----------------------------------------------------------------------


def parse_completion(body: bytes) -> Completion:
    """Read the endpoint's body; ValueError (→ 400) with a reason when it is not valid."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise ValueError("body is not JSON") from None
    if not isinstance(data, dict):
        raise ValueError("body must be a JSON object")
    unknown = sorted(set(data) - {"success", "output", "error"})
    if unknown:
        raise ValueError(f"unknown fields: {', '.join(unknown)[:200]}")
    success = data.get("success")
    if not isinstance(success, bool):
        raise ValueError("'success' must be true or false")
    if success:
        if "error" in data:
            raise ValueError("a successful completion has no 'error'")
        return Completion(True, output=data.get("output"))
    error = data.get("error")
    if "output" in data or not isinstance(error, str) or not error.strip():
        raise ValueError("a failed completion needs a non-empty 'error' string and no 'output'")
    return Completion(False, error=error)
