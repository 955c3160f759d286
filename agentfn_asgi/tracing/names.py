"""Pinned names of :mod:`agentfn_asgi.tracing`: spans, attributes, metrics, buckets.

Pinned here rather than imported from ``opentelemetry-semantic-conventions``, which marks
the ``gen_ai.*`` ones as moved.
"""

from __future__ import annotations

from typing import Final

INSTRUMENTATION_NAME: Final = "agentfn_asgi"
CAPTURE_CONTENT_ENV: Final = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
#: Recorded arguments/results longer than this (UTF-8 bytes) are cut, with a marker.
CONTENT_LIMIT: Final = 8 * 1024
#: How many delivery spans this process remembers, to link the calls they cause.
LINK_CACHE_SIZE: Final = 10_000
#: webhook-id comes from an unverified header: its size is bounded on a span.
ID_LIMIT: Final = 256

# -- span names ----------------------------------------------------------------------------
SPAN_DELIVERY: Final = "agentfn.webhook.delivery"
SPAN_SESSION_READ: Final = "GET session"
SPAN_SUBMISSION: Final = "POST session events"
SPAN_TOOL_PREFIX: Final = "execute_tool "
EVENT_RETRY: Final = "retry"

# -- attribute names (pinned here: the semconv package marks gen_ai.* as moved) -------------
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_TOOL_TYPE: Final = "gen_ai.tool.type"
GEN_AI_TOOL_DESCRIPTION: Final = "gen_ai.tool.description"
GEN_AI_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
ERROR_TYPE: Final = "error.type"
HTTP_RESPONSE_STATUS_CODE: Final = "http.response.status_code"
EXCEPTION_TYPE: Final = "exception.type"
EXCEPTION_STACKTRACE: Final = "exception.stacktrace"
TURN_ID: Final = "openai.agents.turn_id"
CALL_ATTEMPT: Final = "agentfn.call.attempt"
CALL_SOURCE: Final = "agentfn.call.source"
CALL_OUTCOME: Final = "agentfn.call.outcome"
APPROVAL_ID: Final = "agentfn.approval.id"
APPROVAL_DECISION: Final = "agentfn.approval.decision"
APPROVAL_DECIDED_BY: Final = "agentfn.approval.decided_by"
APPROVAL_DECIDED_VIA: Final = "agentfn.approval.decided_via"
APPROVAL_WAITED: Final = "agentfn.approval.waited_s"
#: Seconds the call waited for its tool's limiter (``concurrency=`` / ``rate=``).
LIMIT_WAITED: Final = "agentfn.limit.waited_s"
#: Why a cancelled call was stopped (its turn cancelled, failed with its code...).
CANCEL_REASON: Final = "agentfn.call.cancel_reason"
WEBHOOK_ID: Final = "agentfn.webhook.id"
WEBHOOK_EVENT_TYPE: Final = "agentfn.webhook.event_type"
DELIVERY_OUTCOME: Final = "agentfn.delivery.outcome"
DELIVERY_REASON: Final = "agentfn.delivery.reason"
SESSION_PENDING_CALLS: Final = "agentfn.session.pending_calls"
SUBMISSION_OUTCOME: Final = "agentfn.submission.outcome"
SUBMISSION_ATTEMPTS: Final = "agentfn.submission.attempts"
RETRY_ATTEMPT: Final = "agentfn.retry.attempt"
RETRY_DELAY: Final = "agentfn.retry.delay"
RETRY_REASON: Final = "agentfn.retry.reason"

EXECUTE_TOOL: Final = "execute_tool"
TOOL_TYPE_FUNCTION: Final = "function"
OUTCOME_SUCCESS: Final = "success"
#: error.type of an attempt interrupted by cancellation (shutdown, drain timeout).
ERROR_CANCELLED: Final = "cancelled"
ERROR_SUBMIT: Final = "submit_error"

# -- metric names --------------------------------------------------------------------------
METRIC_DELIVERIES: Final = "agentfn.webhook.deliveries"
METRIC_TOOL_CALLS: Final = "agentfn.tool.calls"
METRIC_TOOL_DURATION: Final = "gen_ai.execute_tool.duration"
METRIC_SUBMISSION_ATTEMPTS: Final = "agentfn.submission.attempts"
METRIC_DELIVERY_TO_RESULT: Final = "agentfn.delivery_to_result.duration"
METRIC_OLDEST_PENDING: Final = "agentfn.calls.oldest_pending.age"
METRIC_RECOVERY_FAILURES: Final = "agentfn.recovery.failures"
METRIC_APPROVALS_WAITING: Final = "agentfn.approvals.waiting"
METRIC_APPROVAL_DECISION: Final = "agentfn.approval.time_to_decision"
METRIC_CALLS_WAITING: Final = "agentfn.tool.calls.waiting"
#: Seconds from an approval request to its decision: a person decides in minutes to a day.
DECISION_BUCKETS: Final = (1.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 86400.0)
RECOVERY_KIND: Final = "agentfn.recovery.kind"

# The GenAI conventions' advised buckets for operation durations (10 ms .. ~82 s).
DURATION_BUCKETS: Final = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                            20.48, 40.96, 81.92)  # fmt: skip
LATENCY_BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                           600.0, 1800.0)  # fmt: skip
ATTEMPT_BUCKETS: Final = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0)
