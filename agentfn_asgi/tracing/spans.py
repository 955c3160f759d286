"""The span classes that :class:`~agentfn_asgi.tracing.Telemetry` hands out, the call's
virtual parent, and what of a value or an exception reaches a span.

See the package docstring for the span names and the one-trace-per-call scheme. The
``capture_content`` rule lives in :func:`_record_error` and :func:`_content_text`: messages
and values are content, exception types and stack frames are not.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
import traceback
from contextvars import ContextVar, Token
from functools import lru_cache
from types import TracebackType
from typing import Final, Protocol, Self

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import (
    INVALID_SPAN,
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
)
from opentelemetry.util.types import AttributeValue

from ..calls.records import ApprovalRequest, SavedResult
from .names import (
    APPROVAL_DECIDED_BY,
    APPROVAL_DECIDED_VIA,
    APPROVAL_DECISION,
    APPROVAL_ID,
    APPROVAL_WAITED,
    CALL_SOURCE,
    CANCEL_REASON,
    CONTENT_LIMIT,
    DELIVERY_OUTCOME,
    DELIVERY_REASON,
    ERROR_CANCELLED,
    ERROR_SUBMIT,
    ERROR_TYPE,
    EVENT_RETRY,
    EXCEPTION_STACKTRACE,
    EXCEPTION_TYPE,
    GEN_AI_CONVERSATION_ID,
    GEN_AI_TOOL_CALL_ARGUMENTS,
    GEN_AI_TOOL_CALL_RESULT,
    HTTP_RESPONSE_STATUS_CODE,
    ID_LIMIT,
    LIMIT_WAITED,
    RETRY_ATTEMPT,
    RETRY_DELAY,
    RETRY_REASON,
    SESSION_PENDING_CALLS,
    SPAN_DELIVERY,
    SPAN_TOOL_PREFIX,
    SUBMISSION_ATTEMPTS,
    SUBMISSION_OUTCOME,
    WEBHOOK_EVENT_TYPE,
    WEBHOOK_ID,
)

__all__ = [
    "RETRY_SINK",
    "CallSpan",
    "DeliverySpan",
    "RetrySink",
    "SessionReadSpan",
    "SubmitSpan",
    "TelemetryHooks",
    "call_parent_context",
    "call_span_context",
]

logger = logging.getLogger("agentfn_asgi.tracing")

_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)


class TelemetryHooks(Protocol):
    """What a span needs of the :class:`~agentfn_asgi.tracing.Telemetry` that made it.

    A protocol, so this module need not import tracing.py (which imports this one).
    """

    @property
    def tracer(self) -> Tracer: ...
    @property
    def capture_content(self) -> bool: ...
    def count_delivery(self, outcome: str, reason: str | None) -> None: ...
    def record_call(
        self, tool_name: str, source: str | None, error_type: str | None, duration: float
    ) -> None: ...


@lru_cache(maxsize=4096)  # tool_call and submission ask for the same call in a row
def call_span_context(session_id: str, call_id: str) -> SpanContext:
    """The call's virtual parent: a remote, sampled span context derived from its ids."""
    digest = hashlib.sha256(f"{session_id}\x1f{call_id}".encode()).digest()
    # All-zero ids are invalid in W3C trace context; a zero digest prefix is only theoretical.
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:24], "big") or 1
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=_SAMPLED)


def call_parent_context(session_id: str, call_id: str) -> otel_context.Context:
    """The current context with the call's virtual remote span as the active span."""
    return trace.set_span_in_context(NonRecordingSpan(call_span_context(session_id, call_id)))


class RetrySink(Protocol):
    def retry(self, attempt: int, delay: float, reason: str, status: int | None) -> None: ...


# The read or submission span currently waiting on the API client, so that the client's
# single ``on_retry`` callback (see Telemetry.client_retry) reaches the right span.
RETRY_SINK: ContextVar[RetrySink | None] = ContextVar("agentfn_asgi_retry_sink", default=None)


class _SpanScope:
    """Starts a span on ``__enter__``, makes it current, ends it on ``__exit__``.

    Span processors are host code: one that raises must not break a request, so starting
    and ending are guarded and fall back to a non-recording span. An exception escaping the
    block marks the span failed unless a failure was already recorded.
    """

    __slots__ = ("_attributes", "_failed", "_kind", "_links", "_name", "_parent", "_telemetry",
                 "_token", "span")  # fmt: skip

    def __init__(
        self,
        telemetry: TelemetryHooks,
        name: str,
        kind: SpanKind,
        attributes: dict[str, AttributeValue],
        parent: otel_context.Context | None = None,
        links: list[Link] | None = None,
    ) -> None:
        self._telemetry = telemetry
        self._name = name
        self._kind = kind
        self._attributes = attributes
        self._parent = parent
        self._links = links
        self._token: Token[otel_context.Context] | None = None
        self._failed = False
        self.span: Span = INVALID_SPAN

    def __enter__(self) -> Self:
        try:
            self.span = self._telemetry.tracer.start_span(
                self._name,
                context=self._parent,
                kind=self._kind,
                attributes=self._attributes,
                links=self._links,
            )
        except Exception:
            logger.exception("starting span %r failed; continuing without it", self._name)
            self.span = INVALID_SPAN
        self._token = otel_context.attach(trace.set_span_in_context(self.span))
        self._entered()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exiting()
        if exc is not None and not self._failed:
            self._fail(_escaped_error_type(exc), None, exc)
        if self._token is not None:
            otel_context.detach(self._token)
            self._token = None
        try:
            self.span.end()
        except Exception:
            logger.exception("ending span %r failed; ignored", self._name)
        self._ended(exc)

    # Hooks for subclasses.
    def _entered(self) -> None:
        pass

    def _exiting(self) -> None:
        pass

    def _ended(self, exc: BaseException | None) -> None:
        pass

    def _fail(self, error_type: str, message: str | None, exc: BaseException | None) -> None:
        self._failed = True
        _record_error(self.span, error_type, message, exc, capture=self._telemetry.capture_content)


class DeliverySpan(_SpanScope):
    """The span of one webhook request (see :meth:`Telemetry.delivery`)."""

    __slots__ = ("_link", "_outcome", "_reason")

    def __init__(self, telemetry: TelemetryHooks, delivery_id: str | None) -> None:
        attributes: dict[str, AttributeValue] = {}
        if delivery_id is not None:
            attributes[WEBHOOK_ID] = delivery_id[:ID_LIMIT]
        super().__init__(telemetry, SPAN_DELIVERY, SpanKind.INTERNAL, attributes)
        self._outcome: str | None = None
        self._reason: str | None = None
        self._link: Link | None = None

    def _entered(self) -> None:
        context = self.span.get_span_context()
        self._link = Link(context) if context.is_valid else None

    def _ended(self, exc: BaseException | None) -> None:
        outcome = self._outcome or ("error" if exc is not None else None)
        if outcome is not None:
            self._telemetry.count_delivery(outcome, self._reason)

    @property
    def link(self) -> Link | None:
        """A link to this span for the work it causes (None when nothing is recorded)."""
        return self._link

    def set_session(self, session_id: str) -> None:
        """Record the session the delivery is about, once the body is parsed."""
        self.span.set_attribute(GEN_AI_CONVERSATION_ID, session_id)

    def set_event_type(self, event_type: str) -> None:
        """Record the webhook event type (``agent.session.action_required``, ...)."""
        self.span.set_attribute(WEBHOOK_EVENT_TYPE, event_type[:ID_LIMIT])

    def set_outcome(self, outcome: str, reason: str | None = None) -> None:
        """Record how the delivery ended; counted once, when the span ends.

        ``outcome``: ``accepted``, ``duplicate``, ``rejected``, ``ignored`` or ``unavailable``;
        ``reason`` a short fixed word (``bad_signature``, ``too_large``, ...). A rejected
        delivery is the sender's error, not ours: as for a 4xx on an HTTP server span the
        status stays unset. ``unavailable`` (we answered 503) sets status ERROR and
        ``error.type`` = reason. (Linking the calls a delivery causes back to this span is
        the caller's explicit step: :meth:`Telemetry.remember_delivery` with :attr:`link`.)
        """
        self._outcome = outcome
        self._reason = reason
        self.span.set_attribute(DELIVERY_OUTCOME, outcome)
        if reason is not None:
            self.span.set_attribute(DELIVERY_REASON, reason)
        if outcome == "unavailable":
            self._fail(reason or "unavailable", None, None)


class _RetryingScope(_SpanScope):
    """A client span that receives the API client's retries as ``retry`` events."""

    __slots__ = ("_retries", "_sink_token")

    def __init__(
        self,
        telemetry: TelemetryHooks,
        name: str,
        attributes: dict[str, AttributeValue],
        parent: otel_context.Context | None = None,
        links: list[Link] | None = None,
    ) -> None:
        super().__init__(telemetry, name, SpanKind.CLIENT, attributes, parent, links)
        self._retries = 0
        self._sink_token: Token[RetrySink | None] | None = None

    def _entered(self) -> None:
        self._sink_token = RETRY_SINK.set(self)

    def _exiting(self) -> None:
        if self._sink_token is not None:
            with contextlib.suppress(ValueError):  # exited in another context: nothing to undo
                RETRY_SINK.reset(self._sink_token)
            self._sink_token = None

    @property
    def attempts(self) -> int:
        """HTTP attempts so far: retries recorded plus one."""
        return self._retries + 1

    def retry(self, attempt: int, delay: float, reason: str, status: int | None) -> None:
        """Record a retry (``attempt`` is the one that failed) as a ``retry`` span event."""
        self._retries += 1
        span = self.span
        if not span.is_recording():
            return
        attributes: dict[str, AttributeValue] = {
            RETRY_ATTEMPT: attempt,
            RETRY_DELAY: delay,
            RETRY_REASON: reason,
        }
        if status is not None:
            attributes[HTTP_RESPONSE_STATUS_CODE] = status
        span.add_event(EVENT_RETRY, attributes)


class SessionReadSpan(_RetryingScope):
    """The span of one session read (see :meth:`Telemetry.session_read`)."""

    __slots__ = ()

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        """Set any attribute on the span (as on an OpenTelemetry ``Span``)."""
        self.span.set_attribute(key, value)

    def set_pending_calls(self, count: int) -> None:
        """Record how many function calls the session was waiting for."""
        self.span.set_attribute(SESSION_PENDING_CALLS, count)


class SubmitSpan(_RetryingScope):
    """The span of one result submission (see :meth:`Telemetry.submission`)."""

    __slots__ = ()

    def _exiting(self) -> None:
        super()._exiting()
        self.span.set_attribute(SUBMISSION_ATTEMPTS, self.attempts)

    def set_outcome(self, outcome: str) -> None:
        """``submitted``, ``stale`` (the API no longer waits for it: not our error, status
        stays unset) or ``failed`` (``error.type=submit_error``, status ERROR; the recovery
        sweep retries it)."""
        self.span.set_attribute(SUBMISSION_OUTCOME, outcome)
        if outcome == "failed":
            self._fail(ERROR_SUBMIT, None, None)


class CallSpan(_SpanScope):
    """The ``execute_tool {name}`` span of one call attempt (see :meth:`Telemetry.tool_call`)."""

    __slots__ = ("_error_type", "_source", "_started", "_tool_name")

    def __init__(
        self,
        telemetry: TelemetryHooks,
        tool_name: str,
        attributes: dict[str, AttributeValue],
        parent: otel_context.Context,
        links: list[Link] | None,
    ) -> None:
        name = SPAN_TOOL_PREFIX + tool_name
        super().__init__(telemetry, name, SpanKind.INTERNAL, attributes, parent, links)
        self._tool_name = tool_name
        self._source: str | None = None
        self._error_type: str | None = None
        self._started = 0.0

    def _entered(self) -> None:
        self._started = time.perf_counter()

    def _fail(self, error_type: str, message: str | None, exc: BaseException | None) -> None:
        self._error_type = error_type
        super()._fail(error_type, message, exc)

    def _ended(self, exc: BaseException | None) -> None:
        duration = time.perf_counter() - self._started
        self._telemetry.record_call(self._tool_name, self._source, self._error_type, duration)

    @property
    def context(self) -> SpanContext:
        """This span's context, to parent the submission span explicitly."""
        return self.span.get_span_context()

    def set_source(self, source: str) -> None:
        """How the result was obtained: ``ran``, ``saved`` (resubmitted), ``reconciled``,
        ``quarantined``, ``worker`` or ``limit`` (decided by flow control: a wait past
        ``max_wait``, a ``concurrency_key`` that raised; nothing ran)."""
        self._source = source
        self.span.set_attribute(CALL_SOURCE, source)

    def note_approval(self, request: ApprovalRequest) -> None:
        """Note on the span the approval request of the call: its id and, once decided, the
        decision, who took it, how, and how long the call waited for it."""
        self.span.set_attribute(APPROVAL_ID, request.approval_id)
        if request.decision is not None:
            self.span.set_attribute(APPROVAL_DECISION, request.decision)
            if request.decided_by:
                self.span.set_attribute(APPROVAL_DECIDED_BY, request.decided_by)
            if request.decided_via:
                self.span.set_attribute(APPROVAL_DECIDED_VIA, request.decided_via)
            if request.decided_at is not None:
                waited = max(0.0, request.decided_at - request.requested_at)
                self.span.set_attribute(APPROVAL_WAITED, round(waited, 3))

    def note_wait(self, seconds: float) -> None:
        """Note on the span how long the call waited for its tool's limiter (flow control)."""
        self.span.set_attribute(LIMIT_WAITED, round(max(0.0, seconds), 3))

    def note_cancelled(self, reason: str) -> None:
        """The call was cancelled while this attempt ran: ``error.type`` ``cancelled`` and
        why (our own words and the turn's error code, never content)."""
        self.set_error("cancelled")
        self.span.set_attribute(CANCEL_REASON, reason)

    def set_error(
        self, error_type: str, message: str | None = None, exc: BaseException | None = None
    ) -> None:
        """Mark the attempt failed: ``error.type`` and status ERROR.

        ``error_type`` comes from a small fixed set: ``validation_error``, ``timeout``,
        ``handler_error``, ``too_large``, ``encoding_error``, ``unknown_tool``, ``in_doubt``,
        ``submit_error``, ``stale``, ``cancelled``. ``message`` (the status description) and
        the exception's message are content, recorded only with ``capture_content``; without
        it the description is ``error_type`` and the exception event holds the exception's
        type and stack frames only.
        """
        self._fail(error_type, message, exc)

    def record_result(self, result: SavedResult, source: str | None = None) -> None:
        """Put how a saved result was obtained, and its failure reason, on the span
        (``source`` overrides the result's own, e.g. ``saved`` for a resubmission)."""
        self.set_source(source or result.source)
        if result.success:
            self.set_result(result.event_json)
        else:
            self.set_error(result.error_type or "handler_error")

    def set_arguments(self, value: object) -> None:
        """Record the call's arguments (JSON text) when content capture is on."""
        if self._telemetry.capture_content and self.span.is_recording():
            self.span.set_attribute(GEN_AI_TOOL_CALL_ARGUMENTS, _content_text(value))

    def set_result(self, value: object) -> None:
        """Record the call's result (JSON text) when content capture is on."""
        if self._telemetry.capture_content and self.span.is_recording():
            self.span.set_attribute(GEN_AI_TOOL_CALL_RESULT, _content_text(value))


# -- what of a value or an exception reaches a span -------------------------------------------


def _qualified_name(exc: BaseException) -> str:
    kind = type(exc)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


def _escaped_error_type(exc: BaseException) -> str:
    # Handler failures are classified by the dispatcher (validation_error, timeout, ...);
    # what escapes a span is ours (store/API errors) or a cancellation. Class names are
    # bounded, as error.type must be; cancellations get one fixed value.
    if not isinstance(exc, Exception):
        return ERROR_CANCELLED
    return _qualified_name(exc)


def _content_text(value: object) -> str:
    """``value`` as JSON text (strings as they are), cut to :data:`CONTENT_LIMIT` bytes."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError):
            text = f"<unserialisable {type(value).__qualname__}>"
    data = text.encode("utf-8", "replace")
    if len(data) <= CONTENT_LIMIT:
        return text
    kept = data[:CONTENT_LIMIT].decode("utf-8", "ignore")
    return f"{kept}...[truncated {len(data) - CONTENT_LIMIT} bytes]"


def _record_error(
    span: Span,
    error_type: str,
    message: str | None,
    exc: BaseException | None,
    *,
    capture: bool,
) -> None:
    span.set_attribute(ERROR_TYPE, error_type)
    # The message may quote handler output or exception text: it is content.
    description = message if capture and message else error_type
    span.set_status(Status(StatusCode.ERROR, description))
    if exc is None or not span.is_recording():
        return
    if capture:
        span.record_exception(exc)
    else:
        span.add_event(
            "exception",
            {
                EXCEPTION_TYPE: _qualified_name(exc),
                EXCEPTION_STACKTRACE: "".join(traceback.format_tb(exc.__traceback__)),
            },
        )
