"""Spans and metrics for deliveries, session reads, tool calls and submissions.

Only the OpenTelemetry *API* is used: the host brings the SDK. :class:`Telemetry` takes a
tracer provider and a meter provider; without them it uses the global ones, so a host that
configured the SDK globally gets spans and metrics with no code, and a host that did not pays
for no-op calls only (tracer, meter and instruments are created once, in ``__init__``).

Spans (instrumentation scope ``agentfn_asgi``)::

    agentfn.webhook.delivery        INTERNAL  one per webhook request
    GET session                     CLIENT    one per session read (client retries = events)
    execute_tool {gen_ai.tool.name} INTERNAL  one per call attempt (GenAI "execute tool" span)
    POST session events             CLIENT    one per result submission (retries = events)

One trace per call: every ``execute_tool`` span of a call, from any attempt, process or
replica, has the same parent, a *virtual* remote span whose trace id and span id are derived
from ``sha256(f"{session_id}\\x1f{call_id}")`` (:func:`trace_id_for_call` gives the trace id,
so a call can be found in any backend from its ``call_id``). The trace has no real root span:
the attempts are siblings under that parent, each linked to the webhook delivery that caused
it when this process received it. Submissions made outside a call span (a resubmission after
a restart) are put under the same virtual parent. The virtual parent is marked *sampled*:
under the SDK's default ``ParentBased`` sampler calls are always recorded; a sampler that
decides from the trace id (``TraceIdRatioBased``) keeps or drops all attempts of a call
together, since they share it.

Content (``gen_ai.tool.call.arguments`` / ``.result``, exception messages, error
descriptions) is recorded only when ``capture_content`` is on; default: the
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` environment variable (``true``/``1``).
Without it, failures still record ``error.type`` and the exception's type and stack frames
(frames hold code, not values), never its message: handler messages may quote secrets.

Metrics::

    agentfn.webhook.deliveries          counter    {delivery}  agentfn.delivery.outcome,
                                                               agentfn.delivery.reason
    agentfn.tool.calls                  counter    {call}      gen_ai.tool.name,
                                                               agentfn.call.outcome,
                                                               agentfn.call.source
    gen_ai.execute_tool.duration        histogram  s           gen_ai.operation.name,
                                                               gen_ai.tool.name, error.type,
                                                               agentfn.call.source
    agentfn.submission.attempts         histogram  {attempt}   -
    agentfn.delivery_to_result.duration histogram  s           -
    agentfn.calls.oldest_pending.age    gauge      s           -
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from contextvars import ContextVar, Token
from functools import lru_cache
from types import TracebackType
from typing import Final, Protocol, Self

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.trace import (
    INVALID_SPAN,
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    TraceFlags,
    TracerProvider,
)
from opentelemetry.util.types import AttributeValue

# Packed on purpose: one name per line would spend ~55 of the lines this split saves.
from ._otel_names import (  # isort: skip
    CALL_ATTEMPT, CALL_OUTCOME, CALL_SOURCE, DELIVERY_OUTCOME, DELIVERY_REASON, ERROR_SUBMIT,
    ERROR_TYPE, EVENT_RETRY, EXECUTE_TOOL, GEN_AI_CONVERSATION_ID, GEN_AI_OPERATION_NAME,
    GEN_AI_TOOL_CALL_ARGUMENTS, GEN_AI_TOOL_CALL_ID, GEN_AI_TOOL_CALL_RESULT,
    GEN_AI_TOOL_DESCRIPTION, GEN_AI_TOOL_NAME, GEN_AI_TOOL_TYPE, HTTP_RESPONSE_STATUS_CODE,
    INSTRUMENTATION_NAME, LINK_CACHE_SIZE, METRIC_DELIVERIES, METRIC_DELIVERY_TO_RESULT,
    METRIC_OLDEST_PENDING, METRIC_SUBMISSION_ATTEMPTS, METRIC_TOOL_CALLS, METRIC_TOOL_DURATION,
    OUTCOME_SUCCESS, RETRY_ATTEMPT, RETRY_DELAY, RETRY_REASON, SESSION_PENDING_CALLS, SPAN_DELIVERY,
    SPAN_SESSION_READ, SPAN_SUBMISSION, SPAN_TOOL_PREFIX, SUBMISSION_ATTEMPTS, SUBMISSION_OUTCOME,
    TOOL_TYPE_FUNCTION, TURN_ID, WEBHOOK_EVENT_TYPE, WEBHOOK_ID, _ATTEMPT_BUCKETS,
    _DURATION_BUCKETS, _ID_LIMIT, _LATENCY_BUCKETS, _capture_from_env, _content_text,
    _escaped_error_type, _record_error,
    # Used by the helpers only now; kept importable from this module, where they were.
    CAPTURE_CONTENT_ENV as CAPTURE_CONTENT_ENV, CONTENT_LIMIT as CONTENT_LIMIT,
    ERROR_CANCELLED as ERROR_CANCELLED, EXCEPTION_STACKTRACE as EXCEPTION_STACKTRACE,
    EXCEPTION_TYPE as EXCEPTION_TYPE,
)  # fmt: skip

__all__ = [
    "CallSpan",
    "DeliverySpan",
    "RetryInfo",
    "SessionReadSpan",
    "SubmitSpan",
    "Telemetry",
    "trace_id_for_call",
]

logger = logging.getLogger("agentfn_asgi.tracing")

_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)


class RetryInfo(Protocol):
    """What a retry notice carries; :class:`agentfn_asgi.client.RetryEvent` fits it."""

    @property
    def attempt(self) -> int: ...  # the 1-based attempt that just failed
    @property
    def delay(self) -> float: ...  # seconds before the next attempt
    @property
    def reason(self) -> str: ...
    @property
    def status(self) -> int | None: ...


@lru_cache(maxsize=4096)  # tool_call and submission ask for the same call in a row
def _call_span_context(session_id: str, call_id: str) -> SpanContext:
    """The call's virtual parent: a remote, sampled span context derived from its ids."""
    digest = hashlib.sha256(f"{session_id}\x1f{call_id}".encode()).digest()
    # All-zero ids are invalid in W3C trace context; a zero digest prefix is only theoretical.
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:24], "big") or 1
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=_SAMPLED)


def trace_id_for_call(session_id: str, call_id: str) -> str:
    """The trace id (32 lowercase hex digits) holding every attempt of one call.

    It is derived from the session and call ids only, so every process computes the same
    one: search your tracing backend for it to see all attempts, retries and submissions.
    """
    return format(_call_span_context(session_id, call_id).trace_id, "032x")


def _virtual_parent(session_id: str, call_id: str) -> otel_context.Context:
    """The current context with the call's virtual remote span as the active span."""
    return trace.set_span_in_context(NonRecordingSpan(_call_span_context(session_id, call_id)))


class _RetrySink(Protocol):
    def retry(self, attempt: int, delay: float, reason: str, status: int | None) -> None: ...


# The read or submission span currently waiting on the API client, so that the client's
# single ``on_retry`` callback (see Telemetry.client_retry) reaches the right span.
_RETRY_SINK: ContextVar[_RetrySink | None] = ContextVar("agentfn_asgi_retry_sink", default=None)


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
        telemetry: Telemetry,
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

    __slots__ = ("_delivery_id", "_link", "_outcome", "_reason")

    def __init__(self, telemetry: Telemetry, delivery_id: str | None) -> None:
        attributes: dict[str, AttributeValue] = {}
        if delivery_id is not None:
            attributes[WEBHOOK_ID] = delivery_id[:_ID_LIMIT]
        super().__init__(telemetry, SPAN_DELIVERY, SpanKind.INTERNAL, attributes)
        self._delivery_id = delivery_id
        self._outcome: str | None = None
        self._reason: str | None = None
        self._link: Link | None = None

    def _entered(self) -> None:
        context = self.span.get_span_context()
        self._link = Link(context) if context.is_valid else None

    def _ended(self, exc: BaseException | None) -> None:
        outcome = self._outcome or ("error" if exc is not None else None)
        if outcome is not None:
            self._telemetry._count_delivery(outcome, self._reason)

    @property
    def link(self) -> Link | None:
        """A link to this span for the work it causes (None when nothing is recorded)."""
        return self._link

    def set_session(self, session_id: str) -> None:
        """Record the session the delivery is about, once the body is parsed."""
        self.span.set_attribute(GEN_AI_CONVERSATION_ID, session_id)

    def set_event_type(self, event_type: str) -> None:
        """Record the webhook event type (``agent.session.action_required``, ...)."""
        self.span.set_attribute(WEBHOOK_EVENT_TYPE, event_type[:_ID_LIMIT])

    def set_outcome(self, outcome: str, reason: str | None = None) -> None:
        """Record how the delivery ended; counted once, when the span ends.

        ``outcome``: ``accepted``, ``duplicate``, ``rejected``, ``ignored`` or ``unavailable``;
        ``reason`` a short fixed word (``bad_signature``, ``too_large``, ...). A rejected
        delivery is the sender's error, not ours: as for a 4xx on an HTTP server span the
        status stays unset. ``unavailable`` (we answered 503) sets status ERROR and
        ``error.type`` = reason. An accepted delivery is remembered so that the calls it
        causes in this process link back to it (:meth:`Telemetry.link_for_delivery`).
        """
        self._outcome = outcome
        self._reason = reason
        self.span.set_attribute(DELIVERY_OUTCOME, outcome)
        if reason is not None:
            self.span.set_attribute(DELIVERY_REASON, reason)
        if outcome == "unavailable":
            self._fail(reason or "unavailable", None, None)
        elif outcome == "accepted" and self._delivery_id is not None:
            self._telemetry.remember_delivery(self._delivery_id, self._link)


class _RetryingScope(_SpanScope):
    """A client span that receives the API client's retries as ``retry`` events."""

    __slots__ = ("_retries", "_sink_token")

    def __init__(
        self,
        telemetry: Telemetry,
        name: str,
        attributes: dict[str, AttributeValue],
        parent: otel_context.Context | None = None,
        links: list[Link] | None = None,
    ) -> None:
        super().__init__(telemetry, name, SpanKind.CLIENT, attributes, parent, links)
        self._retries = 0
        self._sink_token: Token[_RetrySink | None] | None = None

    def _entered(self) -> None:
        self._sink_token = _RETRY_SINK.set(self)

    def _exiting(self) -> None:
        if self._sink_token is not None:
            with contextlib.suppress(ValueError):  # exited in another context: nothing to undo
                _RETRY_SINK.reset(self._sink_token)
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
        telemetry: Telemetry,
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
        self._telemetry._record_call(self._tool_name, self._source, self._error_type, duration)

    @property
    def context(self) -> SpanContext:
        """This span's context, to parent the submission span explicitly."""
        return self.span.get_span_context()

    def set_source(self, source: str) -> None:
        """How the result was obtained: ``ran``, ``saved`` (resubmitted), ``reconciled``,
        ``quarantined`` or ``worker``."""
        self._source = source
        self.span.set_attribute(CALL_SOURCE, source)

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

    def set_arguments(self, value: object) -> None:
        """Record the call's arguments (JSON text) when content capture is on."""
        if self._telemetry.capture_content and self.span.is_recording():
            self.span.set_attribute(GEN_AI_TOOL_CALL_ARGUMENTS, _content_text(value))

    def set_result(self, value: object) -> None:
        """Record the call's result (JSON text) when content capture is on."""
        if self._telemetry.capture_content and self.span.is_recording():
            self.span.set_attribute(GEN_AI_TOOL_CALL_RESULT, _content_text(value))


class Telemetry:
    """Spans and metrics for one app. Give it providers, or let it use the global ones.

    Args:
        tracer_provider: default ``opentelemetry.trace.get_tracer_provider()``.
        meter_provider: default ``opentelemetry.metrics.get_meter_provider()``.
        capture_content: record tool arguments, results and error messages; default from
            ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` (``true``/``1``), else off.
        link_cache_size: how many accepted deliveries are remembered for linking.
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        capture_content: bool | None = None,
        link_cache_size: int = LINK_CACHE_SIZE,
    ) -> None:
        # Imported here: the package __init__ may import this module while it is loading.
        from . import __version__

        tracers = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        meters = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        self.tracer = tracers.get_tracer(INSTRUMENTATION_NAME, __version__)
        self.meter = meters.get_meter(INSTRUMENTATION_NAME, __version__)
        self.capture_content = _capture_from_env() if capture_content is None else capture_content
        self._link_cache_size = link_cache_size
        self._links: OrderedDict[str, Link] = OrderedDict()
        self._pending_sources: list[Callable[[], float | None]] = []
        self._pending_gauge: object | None = None
        meter = self.meter
        self._deliveries = meter.create_counter(
            METRIC_DELIVERIES, unit="{delivery}", description="Webhook deliveries by outcome."
        )
        self._tool_calls = meter.create_counter(
            METRIC_TOOL_CALLS, unit="{call}", description="Tool call attempts by outcome."
        )
        self._tool_duration = meter.create_histogram(
            METRIC_TOOL_DURATION,
            unit="s",
            description="Duration of tool call attempts.",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self._submission_attempts = meter.create_histogram(
            METRIC_SUBMISSION_ATTEMPTS,
            unit="{attempt}",
            description="HTTP attempts needed to submit one result.",
            explicit_bucket_boundaries_advisory=_ATTEMPT_BUCKETS,
        )
        self._delivery_to_result = meter.create_histogram(
            METRIC_DELIVERY_TO_RESULT,
            unit="s",
            description="Time from receiving a delivery to submitting the call's result.",
            explicit_bucket_boundaries_advisory=_LATENCY_BUCKETS,
        )

    # -- spans -----------------------------------------------------------------------------
    def delivery(self, *, delivery_id: str | None) -> DeliverySpan:
        """A span for one webhook request, ``agentfn.webhook.delivery``.

        Kind INTERNAL: when the host is instrumented it already has the SERVER span of this
        HTTP request, and this one nests inside it; a second SERVER span would count the
        request twice. Attributes: ``agentfn.webhook.id``, ``agentfn.delivery.outcome``,
        ``agentfn.delivery.reason``, ``gen_ai.conversation.id`` once known.
        """
        return DeliverySpan(self, delivery_id)

    def remember_delivery(self, delivery_id: str, link: Link | None) -> None:
        """Remember ``link`` for ``delivery_id`` (bounded, least recently used dropped)."""
        if link is None:
            return
        links = self._links
        links[delivery_id] = link
        links.move_to_end(delivery_id)
        while len(links) > self._link_cache_size:
            links.popitem(last=False)

    def link_for_delivery(self, delivery_id: str | None) -> Link | None:
        """The link to the delivery span with that id, if this process received it."""
        if delivery_id is None:
            return None
        return self._links.get(delivery_id)

    def session_read(
        self, *, session_id: str, delivery_link: Link | None = None
    ) -> SessionReadSpan:
        """A CLIENT span ``GET session`` around one (retrying) session read.

        A logical client span, like the GenAI inference spans: the host's httpx
        instrumentation, if any, adds one CLIENT span per HTTP attempt underneath.
        """
        links = [delivery_link] if delivery_link is not None else None
        attributes: dict[str, AttributeValue] = {GEN_AI_CONVERSATION_ID: session_id}
        return SessionReadSpan(self, SPAN_SESSION_READ, attributes, None, links)

    def tool_call(
        self,
        *,
        tool_name: str,
        session_id: str,
        turn_id: str,
        call_id: str,
        attempt: int,
        delivery_link: Link | None = None,
        description: str | None = None,
    ) -> CallSpan:
        """The ``execute_tool {tool_name}`` span of one call attempt (GenAI conventions).

        Its parent is the call's virtual parent (see the module docstring), never the current
        span; it is current inside the block, so spans the handler makes nest under it.
        """
        # gen_ai.operation.name is set at creation: samplers may decide on it.
        attributes: dict[str, AttributeValue] = {
            GEN_AI_OPERATION_NAME: EXECUTE_TOOL,
            GEN_AI_TOOL_NAME: tool_name,
            GEN_AI_TOOL_CALL_ID: call_id,
            GEN_AI_TOOL_TYPE: TOOL_TYPE_FUNCTION,
            GEN_AI_CONVERSATION_ID: session_id,
            TURN_ID: turn_id,
            CALL_ATTEMPT: attempt,
        }
        if description:
            attributes[GEN_AI_TOOL_DESCRIPTION] = description
        links = [delivery_link] if delivery_link is not None else None
        return CallSpan(self, tool_name, attributes, _virtual_parent(session_id, call_id), links)

    def submission(
        self,
        *,
        session_id: str,
        turn_id: str,
        call_id: str,
        parent: SpanContext | None = None,
    ) -> SubmitSpan:
        """A CLIENT span ``POST session events`` for one result submission.

        Parent: ``parent`` if given (a :attr:`CallSpan.context`), else the current span when
        it belongs to this call's trace, else the call's virtual parent.
        """
        context: otel_context.Context | None
        if parent is not None and parent.is_valid:
            context = trace.set_span_in_context(NonRecordingSpan(parent))
        else:
            trace_id = _call_span_context(session_id, call_id).trace_id
            # Inside this call's span: a plain child. Elsewhere (a resubmission after a
            # restart, the sweep) under the call's virtual parent: still the call's trace.
            current = trace.get_current_span().get_span_context()
            context = None if current.trace_id == trace_id else _virtual_parent(session_id, call_id)
        attributes: dict[str, AttributeValue] = {
            GEN_AI_CONVERSATION_ID: session_id,
            GEN_AI_TOOL_CALL_ID: call_id,
            TURN_ID: turn_id,
        }
        return SubmitSpan(self, SPAN_SUBMISSION, attributes, context)

    def client_retry(self, event: RetryInfo) -> None:
        """Pass as ``AgentsClient(on_retry=telemetry.client_retry)``: each retry becomes an
        event on the read or submission span being waited on (found through the context)."""
        sink = _RETRY_SINK.get()
        if sink is not None:
            sink.retry(event.attempt, event.delay, event.reason, event.status)

    # -- metrics ---------------------------------------------------------------------------
    def record_submission(self, *, attempts: int, delivery_to_submit_seconds: float | None) -> None:
        """Record one submitted result: HTTP attempts, and the time since its delivery."""
        self._submission_attempts.record(attempts)
        if delivery_to_submit_seconds is not None:
            self._delivery_to_result.record(max(delivery_to_submit_seconds, 0.0))

    def observe_pending(self, source: Callable[[], float | None]) -> None:
        """Report ``source()`` (age in seconds of the oldest pending call, or None) as the
        gauge ``agentfn.calls.oldest_pending.age``; with several sources, the largest."""
        self._pending_sources.append(source)
        if self._pending_gauge is None:
            self._pending_gauge = self.meter.create_observable_gauge(
                METRIC_OLDEST_PENDING,
                callbacks=[self._observe_pending],
                unit="s",
                description="Age of the oldest call waiting for its result to be submitted.",
            )

    def _observe_pending(self, _options: CallbackOptions) -> Iterable[Observation]:
        ages: list[float] = []
        for source in self._pending_sources:
            try:
                age = source()
            except Exception:
                # Runs on the SDK's export thread: a failing source must not stop the others.
                logger.exception("pending-call age source failed")
                continue
            if age is not None:
                ages.append(age)
        return [Observation(max(ages))] if ages else []

    def _count_delivery(self, outcome: str, reason: str | None) -> None:
        attributes: dict[str, AttributeValue] = {DELIVERY_OUTCOME: outcome}
        if reason is not None:
            attributes[DELIVERY_REASON] = reason
        self._deliveries.add(1, attributes)

    def _record_call(
        self, tool_name: str, source: str | None, error_type: str | None, duration: float
    ) -> None:
        counted: dict[str, AttributeValue] = {
            GEN_AI_TOOL_NAME: tool_name,
            CALL_OUTCOME: error_type or OUTCOME_SUCCESS,
        }
        timed: dict[str, AttributeValue] = {
            GEN_AI_OPERATION_NAME: EXECUTE_TOOL,
            GEN_AI_TOOL_NAME: tool_name,
        }
        if source is not None:
            counted[CALL_SOURCE] = source
            timed[CALL_SOURCE] = source
        if error_type is not None:
            timed[ERROR_TYPE] = error_type
        self._tool_calls.add(1, counted)
        self._tool_duration.record(duration, timed)
