"""Spans and metrics for deliveries, session reads, tool calls and submissions.

Only the OpenTelemetry *API* is used: the host brings the SDK. :class:`Telemetry` takes a
tracer provider and a meter provider; without them it uses the global ones, so a host that
configured the SDK globally gets spans and metrics with no code, and a host that did not pays
for no-op calls only (tracer, meter and instruments are created once, in ``__init__``).

Modules: ``names`` (pinned span, attribute and metric names), ``spans`` (the span classes,
the call's virtual parent), ``telemetry`` (:class:`Telemetry`: providers, spans, metrics).

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
descriptions) is recorded only when ``capture_content`` is on (the app turns it on from the
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` environment variable, read by
:mod:`agentfn_asgi.config`).
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
    agentfn.recovery.failures           counter    {failure}   agentfn.recovery.kind
"""

from __future__ import annotations

from agentfn_asgi.tracing.spans import CallSpan, DeliverySpan, SessionReadSpan, SubmitSpan
from agentfn_asgi.tracing.telemetry import RetryInfo, Telemetry, trace_id_for_call

__all__ = [
    "CallSpan",
    "DeliverySpan",
    "RetryInfo",
    "SessionReadSpan",
    "SubmitSpan",
    "Telemetry",
    "trace_id_for_call",
]
