"""A call's outcome as the dispatcher saves it: a handler's value or failure as a SavedResult.

Pure functions (no I/O): the event JSON that will be submitted, the idempotency key it travels
under, the request body, and the model-facing messages for outcomes the dispatcher decides
itself (an in-doubt call, an unknown tool). dispatch.py re-exports the messages.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from .errors import ResultEncodingError, ResultTooLargeError
from .records import CallKey, CallRecord, SavedResult
from .results import (
    check_size,
    encode_output,
    event_json,
    failure_event,
    fit_text_output,
    model_error_message,
    success_event,
    too_large_message,
)
from .tools import FunctionTool
from .tracing import CallSpan

__all__ = [
    "IN_DOUBT_MESSAGE",
    "UNKNOWN_TOOL_MESSAGE",
    "describe",
    "encode_result",
    "events_body",
    "failure_result",
    "submission_key",
]

# The dispatcher's logger: operators filter on it, and these messages were always logged there.
logger = logging.getLogger("agentfn_asgi.dispatch")

#: What the model is told when a side-effect call is in doubt and cannot be reconciled.
IN_DOUBT_MESSAGE = (
    "This call may or may not have completed: the service restarted while running it and "
    "could not confirm the outcome. Do not repeat it; ask the user to check before retrying."
)
UNKNOWN_TOOL_MESSAGE = "No handler is registered for the function '{name}' in this service."


def submission_key(key: CallKey, event_json_text: str) -> str:
    """The idempotency key the result ``event_json_text`` of ``key`` is submitted under."""
    # Derived from the call *and* the bytes sent: the same result always travels under the
    # same key (safe retries from any replica), a different body never reuses one.
    digest = hashlib.sha256()
    for part in (key.session_id, key.turn_id, key.call_id, event_json_text):
        # In slices, so hashing a 4 MiB result never holds a second full copy of it.
        for start in range(0, len(part), _HASH_SLICE):
            digest.update(part[start : start + _HASH_SLICE].encode())
        digest.update(b"\x1f")
    return "afn-submit-" + digest.hexdigest()[:48]


_HASH_SLICE = 256 * 1024


def events_body(event_json_text: str) -> bytes:
    """The submission request body carrying one saved event."""
    return b'{"events":[' + event_json_text.encode() + b"]}"


def encode_result(
    key: CallKey, tool: FunctionTool, value: Any, *, source: str, limit: int, margin: int
) -> SavedResult:
    """``value`` returned by ``tool`` as the result to save: a success event, or a failure
    when it cannot be encoded or (unless the tool truncates text) is over ``limit``."""
    try:
        output = encode_output(value)
    except ResultEncodingError as exc:
        logger.error("tool %s returned an unsendable value for call %s: %s", tool.name, key, exc)
        return failure_result(key, model_error_message(exc, tool_name=tool.name), "encoding_error")
    text = event_json(success_event(key.turn_id, key.call_id, output))
    try:
        check_size(text, limit=limit, margin=margin)
    except ResultTooLargeError as exc:
        if tool.truncate_oversize and isinstance(output, str):
            truncated = fit_text_output(
                key.turn_id, key.call_id, output, limit=limit, margin=margin
            )
            text = event_json(success_event(key.turn_id, key.call_id, truncated))
            return SavedResult(True, text, submission_key(key, text), None, source)
        failure = failure_result(key, too_large_message(exc.size, exc.limit), "too_large")
        # Keep the full result: an operator (or a smarter retry) may still want it.
        full = output if isinstance(output, str) else event_json({"output": output})
        return SavedResult(
            False, failure.event_json, failure.idempotency_key, "too_large", source, full
        )
    return SavedResult(True, text, submission_key(key, text), None, source)


def failure_result(key: CallKey, message: str, error_type: str, source: str = "ran") -> SavedResult:
    """A failure event telling the model ``message``, saved with ``error_type``."""
    text = event_json(failure_event(key.turn_id, key.call_id, message))
    return SavedResult(False, text, submission_key(key, text), error_type, source)


def describe(span: CallSpan, record: CallRecord, source: str | None = None) -> None:
    """Put how the result was obtained, and its failure reason, on the call span."""
    result = record.result
    if result is None:
        return
    span.set_source(source or result.source)
    if result.success:
        span.set_result(result.event_json)
    else:
        span.set_error(result.error_type or "handler_error")
