"""``Telemetry``: the tracer, the meter and the instruments of one app (see the package
docstring for what it records)."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Protocol

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, TracerProvider
from opentelemetry.util.types import AttributeValue

from .._version import __version__
from .names import (
    APPROVAL_DECISION,
    ATTEMPT_BUCKETS,
    CALL_ATTEMPT,
    CALL_OUTCOME,
    CALL_SOURCE,
    DECISION_BUCKETS,
    DELIVERY_OUTCOME,
    DELIVERY_REASON,
    DURATION_BUCKETS,
    ERROR_TYPE,
    EXECUTE_TOOL,
    GEN_AI_CONVERSATION_ID,
    GEN_AI_OPERATION_NAME,
    GEN_AI_TOOL_CALL_ID,
    GEN_AI_TOOL_DESCRIPTION,
    GEN_AI_TOOL_NAME,
    GEN_AI_TOOL_TYPE,
    INSTRUMENTATION_NAME,
    LATENCY_BUCKETS,
    LINK_CACHE_SIZE,
    METRIC_APPROVAL_DECISION,
    METRIC_APPROVALS_WAITING,
    METRIC_CALLS_WAITING,
    METRIC_DELIVERIES,
    METRIC_DELIVERY_TO_RESULT,
    METRIC_OLDEST_PENDING,
    METRIC_RECOVERY_FAILURES,
    METRIC_SUBMISSION_ATTEMPTS,
    METRIC_TOOL_CALLS,
    METRIC_TOOL_DURATION,
    OUTCOME_SUCCESS,
    RECOVERY_KIND,
    SPAN_SESSION_READ,
    SPAN_SUBMISSION,
    TOOL_TYPE_FUNCTION,
    TURN_ID,
)
from .spans import (
    RETRY_SINK,
    CallSpan,
    DeliverySpan,
    SessionReadSpan,
    SubmitSpan,
    call_parent_context,
    call_span_context,
)

__all__ = ["RetryInfo", "Telemetry", "trace_id_for_call"]

logger = logging.getLogger("agentfn_asgi.tracing")


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


def trace_id_for_call(session_id: str, call_id: str) -> str:
    """The trace id (32 lowercase hex digits) holding every attempt of one call.

    It is derived from the session and call ids only, so every process computes the same
    one: search your tracing backend for it to see all attempts, retries and submissions.
    """
    return format(call_span_context(session_id, call_id).trace_id, "032x")


class Telemetry:
    """Spans and metrics for one app. Give it providers, or let it use the global ones.

    Args:
        tracer_provider: default ``opentelemetry.trace.get_tracer_provider()``.
        meter_provider: default ``opentelemetry.metrics.get_meter_provider()``.
        capture_content: record tool arguments, results and error messages (default off;
            the app sets it from ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``).
        link_cache_size: how many accepted deliveries are remembered for linking.
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        capture_content: bool = False,
        link_cache_size: int = LINK_CACHE_SIZE,
    ) -> None:
        tracers = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        meters = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        self.tracer = tracers.get_tracer(INSTRUMENTATION_NAME, __version__)
        self.meter = meters.get_meter(INSTRUMENTATION_NAME, __version__)
        self.capture_content = capture_content
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
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self._submission_attempts = meter.create_histogram(
            METRIC_SUBMISSION_ATTEMPTS,
            unit="{attempt}",
            description="HTTP attempts needed to submit one result.",
            explicit_bucket_boundaries_advisory=ATTEMPT_BUCKETS,
        )
        self._recovery_failures = meter.create_counter(
            METRIC_RECOVERY_FAILURES,
            unit="{failure}",
            description="Records the recovery sweep failed on (retried later with backoff).",
        )
        self._calls_waiting = meter.create_up_down_counter(
            METRIC_CALLS_WAITING,
            unit="{call}",
            description="Calls waiting here for their tool's concurrency or rate limit, by tool.",
        )
        self._approvals_waiting: int | None = None
        self._approval_gauge: object | None = None
        self._approval_decision = meter.create_histogram(
            METRIC_APPROVAL_DECISION,
            unit="s",
            description="Time from an approval request to its decision, by decision.",
            explicit_bucket_boundaries_advisory=DECISION_BUCKETS,
        )
        self._delivery_to_result = meter.create_histogram(
            METRIC_DELIVERY_TO_RESULT,
            unit="s",
            description="Time from receiving a delivery to submitting the call's result.",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS,
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
        return CallSpan(
            self, tool_name, attributes, call_parent_context(session_id, call_id), links
        )

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
            trace_id = call_span_context(session_id, call_id).trace_id
            # Inside this call's span: a plain child. Elsewhere (a resubmission after a
            # restart, the sweep) under the call's virtual parent: still the call's trace.
            current = trace.get_current_span().get_span_context()
            context = (
                None if current.trace_id == trace_id else call_parent_context(session_id, call_id)
            )
        attributes: dict[str, AttributeValue] = {
            GEN_AI_CONVERSATION_ID: session_id,
            GEN_AI_TOOL_CALL_ID: call_id,
            TURN_ID: turn_id,
        }
        return SubmitSpan(self, SPAN_SUBMISSION, attributes, context)

    def client_retry(self, event: RetryInfo) -> None:
        """Pass as ``AgentsClient(on_retry=telemetry.client_retry)``: each retry becomes an
        event on the read or submission span being waited on (found through the context)."""
        sink = RETRY_SINK.get()
        if sink is not None:
            sink.retry(event.attempt, event.delay, event.reason, event.status)

    # -- metrics ---------------------------------------------------------------------------
    def record_submission(self, *, attempts: int, delivery_to_submit_seconds: float | None) -> None:
        """Record one submitted result: HTTP attempts, and the time since its delivery."""
        self._submission_attempts.record(attempts)
        if delivery_to_submit_seconds is not None:
            self._delivery_to_result.record(max(delivery_to_submit_seconds, 0.0))

    def record_recovery_failure(self, kind: str) -> None:
        """Count one record the sweep could not finish (``delivery`` or ``submission``)."""
        self._recovery_failures.add(1, {RECOVERY_KIND: kind})

    def add_calls_waiting(self, tool_name: str, delta: int) -> None:
        """A call of ``tool_name`` began (+1) or stopped (-1) waiting in this process for its
        tool's limiter, the gauge ``agentfn.tool.calls.waiting`` (flow control)."""
        self._calls_waiting.add(delta, {GEN_AI_TOOL_NAME: tool_name})

    def set_approvals_waiting(self, count: int) -> None:
        """The number of approval requests waiting for a person (the store's count, as the
        dispatcher last read it), reported as the gauge ``agentfn.approvals.waiting``."""
        self._approvals_waiting = count
        if self._approval_gauge is None:
            self._approval_gauge = self.meter.create_observable_gauge(
                METRIC_APPROVALS_WAITING,
                callbacks=[self._observe_approvals],
                unit="{request}",
                description="Approval requests waiting for a person's decision.",
            )

    def _observe_approvals(self, _options: CallbackOptions) -> Iterable[Observation]:
        count = self._approvals_waiting
        return [] if count is None else [Observation(count)]

    def record_approval_decision(self, decision: str, seconds: float) -> None:
        """One decision (``approved``, ``denied``, ``expired``) taken ``seconds`` after the
        request, into the histogram ``agentfn.approval.time_to_decision``."""
        self._approval_decision.record(max(0.0, seconds), {APPROVAL_DECISION: decision})

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

    def count_delivery(self, outcome: str, reason: str | None) -> None:
        """Count one webhook delivery by outcome (called by its span when it ends)."""
        attributes: dict[str, AttributeValue] = {DELIVERY_OUTCOME: outcome}
        if reason is not None:
            attributes[DELIVERY_REASON] = reason
        self._deliveries.add(1, attributes)

    def record_call(
        self, tool_name: str, source: str | None, error_type: str | None, duration: float
    ) -> None:
        """Count and time one call attempt (called by its span when it ends)."""
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
