"""The app's side of worker jobs: completion tokens, building and queueing jobs, reading
completions.

What the web process needs to hand a call to a worker and accept its result; the worker's
side (running a job, posting its completion) is in worker.py, which documents the whole
protocol and re-exports these names.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal, cast

import anyio
import anyio.to_thread
from itsdangerous import BadData, URLSafeTimedSerializer
from itsdangerous.timed import TimestampSigner
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ._spans import _virtual_parent
from .errors import CompletionTokenError, CompletionTokenExpiredError, ConfigurationError
from .records import CallKey
from .tools import FunctionTool, FunctionTools, ToolContext, is_async_callable

__all__ = [
    "CLOCK_SKEW",
    "COMPLETE_PATH",
    "COMPLETION_BODY_LIMIT",
    "COMPLETION_SECRET_ENV",
    "DEFAULT_TOKEN_MAX_AGE",
    "ENQUEUE_FAILED_MESSAGE",
    "JOB_DEADLINE_MESSAGE",
    "MAX_TOKEN_LENGTH",
    "MIN_SECRET_LENGTH",
    "PUBLIC_URL_ENV",
    "TOKEN_SALT",
    "Completion",
    "CompletionStatus",
    "CompletionTokens",
    "Job",
    "TokenClaims",
    "bearer_token",
    "build_job",
    "call_enqueue",
    "completion_setup",
    "parse_completion",
]

#: The environment variable holding the completion secret(s), newest last.
COMPLETION_SECRET_ENV = "AGENTFN_COMPLETION_SECRET"  # noqa: S105 - a variable name
#: The public URL of the webhook mount, to put ``complete_url`` into jobs.
PUBLIC_URL_ENV = "AGENTFN_PUBLIC_URL"
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

#: What the model is told when a job's deadline passed with no completion.
JOB_DEADLINE_MESSAGE = (
    "The background job for this call did not finish within its deadline. It may or may "
    "not have taken effect; do not repeat it without checking with the user."
)
#: What the model is told when the enqueue callable raised.
ENQUEUE_FAILED_MESSAGE = (
    "The tool '{name}' could not be started: its background job could not be queued. "
    "It did not run; you may try again later."
)

#: What :meth:`Dispatcher.complete` decided (the endpoint maps it to a status code).
CompletionStatus = Literal["accepted", "duplicate", "conflict", "stale", "unknown_tool"]

_SEPARATORS = re.compile(r"[\s,]+")
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


def _split_secrets(value: str | Sequence[str]) -> list[str]:
    items = [value] if isinstance(value, str) else list(value)
    found: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigurationError("completion secrets must be strings")
        found.extend(piece for piece in _SEPARATORS.split(item) if piece)
    return found


class CompletionTokens:
    """Issue and verify the signed, expiring token that lets a worker complete one call.

    Args:
        secrets: one secret, or several for a rotation (a list, or one string separated by
            spaces or commas), **newest last**: tokens are signed with the last one and
            verified against all. Each must be at least 16 characters; generate one with
            ``python -c "import secrets; print(secrets.token_urlsafe(32))"``.
        max_age: a cap on any token's life in seconds, whatever the job deadline.
        clock: Unix time source (tests inject one; replicas should share real time).
    """

    def __init__(
        self,
        secrets: str | Sequence[str],
        *,
        max_age: float = DEFAULT_TOKEN_MAX_AGE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        keys = _split_secrets(secrets)
        if not keys:
            raise ConfigurationError(
                f"no completion secret: pass completion_secret= or set {COMPLETION_SECRET_ENV}"
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
            keys, salt=TOKEN_SALT, signer=_ClockedSigner, signer_kwargs={"clock": clock}
        )

    def issue(
        self, key: CallKey, *, owner: str, tool_name: str, expires_at: float | None = None
    ) -> str:
        """A token completing ``key`` only, valid until ``expires_at`` (capped by max_age)."""
        limit = self._clock() + self.max_age
        expiry = limit if expires_at is None else min(expires_at, limit)
        payload = {
            "s": key.session_id,
            "t": key.turn_id,
            "c": key.call_id,
            "o": owner,
            "n": tool_name,
            "x": round(expiry, 3),
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

    @classmethod
    def from_env(cls, **kwargs: Any) -> CompletionTokens | None:
        """Tokens from ``AGENTFN_COMPLETION_SECRET``, or None when it is unset or empty."""
        import os

        value = os.environ.get(COMPLETION_SECRET_ENV, "")
        return cls(value, **kwargs) if value.strip() else None


def completion_setup(
    tools: FunctionTools,
    *,
    secret: str | Sequence[str] | None,
    public_url: str | None,
    clock: Callable[[], float] = time.time,
) -> tuple[CompletionTokens | None, str | None]:
    """The app's tokens and completion URL, from its options or the environment.

    Raises ConfigurationError when a tool enqueues jobs but no secret is configured.
    """
    import os

    value = secret if secret is not None else os.environ.get(COMPLETION_SECRET_ENV, "")
    tokens = CompletionTokens(value, clock=clock) if _split_secrets(value) else None
    queued = sorted(tool.name for tool in tools if tool.enqueue is not None)
    if tokens is None and queued:
        raise ConfigurationError(
            f"tools {queued} hand calls to workers but no completion secret is set: pass "
            f"completion_secret= or set {COMPLETION_SECRET_ENV} (a random string of 16+ "
            "characters, not the webhook secret)"
        )
    url = public_url if public_url is not None else os.environ.get(PUBLIC_URL_ENV, "")
    return tokens, (url.rstrip("/") + COMPLETE_PATH if url else None)


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
    return TokenClaims(s, t, c, o, n, float(expiry))


# -- jobs ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """One call handed to a worker. JSON-safe: ``Job.from_dict(job.to_dict()) == job``.

    ``arguments`` is the validated argument object in the tool's schema shape (re-parse it
    with ``tool.parse_arguments`` for typed values; :func:`run_job` does). ``deadline`` is
    the Unix time after which the call fails and completions are refused. ``complete_url``
    is set when the app knows its public URL (``public_url=``). ``traceparent`` /
    ``tracestate`` (W3C) let the worker's span join the call's trace
    (:meth:`trace_context`). Pass ``idempotency_key`` to downstream APIs.
    """

    session_id: str
    turn_id: str
    call_id: str
    tool_name: str
    arguments: dict[str, Any]
    idempotency_key: str
    completion_token: str
    deadline: float
    attempt: int = 1
    complete_url: str | None = None
    traceparent: str = ""
    tracestate: str = ""

    def to_dict(self) -> dict[str, Any]:
        """A plain dict of JSON values (give it to Celery, RQ, arq, json.dumps...)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to_json(self) -> str:
        """Compact JSON of :meth:`to_dict`."""
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Job:
        """Rebuild a job; ValueError naming the field when something is missing or wrong."""
        if not isinstance(data, Mapping):
            raise ValueError("a job must be a JSON object")
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                if f.name in _OPTIONAL_FIELDS:
                    continue
                raise ValueError(f"job field {f.name!r} is missing")
            value = data[f.name]
            expected = _FIELD_TYPES[f.name]
            if not isinstance(value, expected) or isinstance(value, bool):
                raise ValueError(f"job field {f.name!r} has the wrong type")
            values[f.name] = value
        values["deadline"] = float(values["deadline"])
        return cls(**values)

    @classmethod
    def from_json(cls, text: str | bytes) -> Job:
        """Rebuild a job from :meth:`to_json` output."""
        return cls.from_dict(json.loads(text))

    def remaining(self, *, clock: Callable[[], float] = time.time) -> float:
        """Seconds left before the deadline (never negative)."""
        return max(0.0, self.deadline - clock())

    def tool_context(self, *, resources: Any = None) -> ToolContext:
        """The :class:`ToolContext` a handler gets when the worker runs this job."""
        return ToolContext(
            session_id=self.session_id,
            turn_id=self.turn_id,
            call_id=self.call_id,
            tool_name=self.tool_name,
            attempt=self.attempt,
            deadline=self.deadline,
            idempotency_key=self.idempotency_key,
            resources=resources,
        )

    def trace_context(self) -> otel_context.Context:
        """An OpenTelemetry context whose parent is the call's span, for the worker's span:
        ``tracer.start_as_current_span("work", context=job.trace_context())``."""
        carrier = {"traceparent": self.traceparent}
        if self.tracestate:
            carrier["tracestate"] = self.tracestate
        return _W3C.extract(carrier)


_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "session_id": str,
    "turn_id": str,
    "call_id": str,
    "tool_name": str,
    "arguments": dict,
    "idempotency_key": str,
    "completion_token": str,
    "deadline": (int, float),
    "attempt": int,
    "complete_url": (str, type(None)),
    "traceparent": str,
    "tracestate": str,
}
_OPTIONAL_FIELDS = frozenset({"attempt", "complete_url", "traceparent", "tracestate"})


def _trace_headers(key: CallKey) -> tuple[str, str]:
    """W3C headers of the current span, or of the call's virtual parent span when there is
    none, so a worker's span always lands in the call's trace (see tracing.py)."""
    ctx = otel_context.get_current()
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        ctx = _virtual_parent(key.session_id, key.call_id)
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
    """The job for one validated call (used by the dispatcher)."""
    deadline = now + tool.job_deadline
    traceparent, tracestate = _trace_headers(key)
    return Job(
        session_id=key.session_id,
        turn_id=key.turn_id,
        call_id=key.call_id,
        tool_name=tool.name,
        arguments=tool.dump_arguments(arguments),
        idempotency_key=idempotency_key,
        completion_token=tokens.issue(key, owner=owner, tool_name=tool.name, expires_at=deadline),
        deadline=deadline,
        attempt=attempt,
        complete_url=complete_url,
        traceparent=traceparent,
        tracestate=tracestate,
    )


async def call_enqueue(
    enqueue: Callable[[Job], Any], job: Job, *, limiter: anyio.CapacityLimiter | None = None
) -> None:
    """Hand ``job`` to ``enqueue``: an async callable is awaited on the loop; a sync one runs
    in the thread pool like a sync handler (its broker I/O must not block the loop), and an
    awaitable it returns is awaited. Use an async callable for loop-bound objects such as
    an ``asyncio.Queue`` or a ``redis.asyncio`` client."""
    if is_async_callable(enqueue):
        result = await enqueue(job)
    else:
        result = await anyio.to_thread.run_sync(
            functools.partial(enqueue, job), limiter=limiter, abandon_on_cancel=True
        )
    if inspect.isawaitable(result):
        await result


# -- completions ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Completion:
    """A worker's outcome for one job: ``output`` (any JSON value, encoded like a handler's
    return value) when ``success``, else ``error`` (shown to the model as written)."""

    success: bool
    output: Any = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The endpoint's JSON body."""
        if self.success:
            return {"success": True, "output": self.output}
        return {"success": False, "error": self.error or ""}


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
