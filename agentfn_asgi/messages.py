"""What the model is told when a call does not succeed as written.

Every model-facing failure text is here: the fixed messages (an internal error, a call in
doubt, an unknown tool...), the texts built from an exception (:func:`model_error_message`:
a :class:`~agentfn_asgi.errors.ToolError` as written; argument problems as field paths and
expected types; anything else a fixed safe message, because exception text may contain
secrets), and the low-cardinality error type spans and metrics use (:func:`error_type_for`).
Argument validation errors are worded without the submitted values
(:func:`validation_error_message`). :mod:`agentfn_asgi.results` puts them into events.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Mapping
from typing import Any

from pydantic_core.core_schema import ErrorType

from .errors import ArgumentValidationError, ResultEncodingError, ResultTooLargeError, ToolError

__all__ = [
    "APPROVAL_ARGUMENTS_CHANGED_MESSAGE",
    "APPROVAL_DENIED_MESSAGE",
    "APPROVAL_EXPIRED_MESSAGE",
    "CALL_BUDGET_MESSAGE",
    "ENQUEUE_FAILED_MESSAGE",
    "INTERNAL_ERROR_MESSAGE",
    "INTERNAL_FAILURE_MESSAGE",
    "IN_DOUBT_MESSAGE",
    "JOB_DEADLINE_MESSAGE",
    "LIMIT_KEY_FAILED_MESSAGE",
    "MAX_WAIT_MESSAGE",
    "REDELIVERED_IN_DOUBT_MESSAGE",
    "RETRIED_SUFFIX",
    "RETRY_LATER_EXHAUSTED_MESSAGE",
    "STORE_REFUSED_MESSAGE",
    "THREADS_BUSY_MESSAGE",
    "TOO_MANY_ATTEMPTS_MESSAGE",
    "UNKNOWN_TOOL_MESSAGE",
    "UNREADABLE_ARGUMENTS_MESSAGE",
    "error_type_for",
    "model_error_message",
    "timeout_message",
    "too_large_message",
    "validation_error_message",
]

#: What the model sees for any failure that is not a ToolError, a validation error, a
#: timeout or an oversized result.
INTERNAL_ERROR_MESSAGE = (
    "The tool failed with an internal error. "
    "Do not retry with the same arguments unless the user asks."
)

#: What the model is told when a person denied the call (``{reason}``: theirs, or a default).
APPROVAL_DENIED_MESSAGE = "A person reviewed this call of '{name}' and denied it: {reason}"
#: What the model is told when nobody decided on the call before its request expired.
APPROVAL_EXPIRED_MESSAGE = (
    "This call of '{name}' needed a person's approval and nobody approved it in time; it "
    "did not run. Tell the user, and only call it again if they ask."
)
#: The arguments of an approved call differ from those the person approved (never expected:
#: the API does not change a pending call's arguments).
APPROVAL_ARGUMENTS_CHANGED_MESSAGE = (
    "This call of '{name}' was approved for other arguments than it carries; it did not run."
)

#: What the model is told when a side-effect call is in doubt and cannot be reconciled.
IN_DOUBT_MESSAGE = (
    "This call may or may not have completed: the service restarted while running it and "
    "could not confirm the outcome. Do not repeat it; ask the user to check before retrying."
)
#: What the model is told when no handler is registered for the called function.
UNKNOWN_TOOL_MESSAGE = "No handler is registered for the function '{name}' in this service."
#: What the model is told when the API sent arguments that cannot be read at all.
UNREADABLE_ARGUMENTS_MESSAGE = (
    "The arguments of this call could not be read ({reason}). Call the tool again with "
    "plain JSON arguments."
)
#: What the model is told when obtaining the result failed in a way the package did not
#: foresee (the failure is logged); the call is answered rather than retried forever.
INTERNAL_FAILURE_MESSAGE = (
    "The tool could not be run because of an internal error in the service. "
    "Do not retry with the same arguments unless the user asks."
)
#: What the model is told when a call came back in doubt too many times (its process died
#: each time it ran); it is not run again.
TOO_MANY_ATTEMPTS_MESSAGE = (
    "This call was started {attempts} times and never finished (the service stopped while "
    "running it each time). It will not be retried; it may or may not have taken effect."
)
#: What the model sees when a handler kept asking to be retried later past the tool's bounds.
RETRY_LATER_EXHAUSTED_MESSAGE = (
    "Tool '{name}' is temporarily unavailable (it asked to be retried later too many times)."
    " Try again later or tell the user."
)
#: Appended to the failure of a call whose last attempt failed after retries (flow control).
RETRIED_SUFFIX = (
    " (This call was tried {attempts} times; the last attempt failed with {error}. It will"
    " not be retried again.)"
)
#: What the model is told when a sync handler could not start: every thread of the pool was
#: busy (hung handlers hold their threads: Python cannot stop them).
#: A call of a limited tool (``concurrency=`` / ``rate=``) waited ``max_wait`` for its turn.
MAX_WAIT_MESSAGE = (
    "Tool '{name}' is busy: this call waited {seconds:g} seconds for its turn and did not run."
    " Try again later, or tell the user the tool is busy."
)
#: The session already used its budget of calls of this tool (``max_calls_per_session``):
#: the call did not run, and none of the tool will in this session.
CALL_BUDGET_MESSAGE = (
    "Tool '{name}' did not run: this session used its budget of {budget} calls of it"
    " (max_calls_per_session). Do not call it again in this session; go on without it or"
    " tell the user."
)
#: A tool's ``concurrency_key`` raised for this call (the call did not run).
LIMIT_KEY_FAILED_MESSAGE = (
    "Tool '{name}' could not run this call: the service could not tell which limit it falls"
    " under. It did not run; tell the user."
)
#: The service's store refused a value of this call (a limiter's or a tool's name it cannot
#: hold): retrying would never succeed, so the call fails without running.
STORE_REFUSED_MESSAGE = (
    "This call of '{name}' could not be recorded: it carries a value the service cannot "
    "store (too long, or holding characters it cannot keep). It did not run; call it again "
    "with shorter, plain values."
)
THREADS_BUSY_MESSAGE = (
    "Tool '{name}' could not start: the service had no free thread for it within "
    "{seconds:g} seconds. It did not run; you may try again later."
)
#: What the model is told when a side-effect job was delivered again by a worker queue (its
#: worker died) and its reconcile hook cannot tell whether the first delivery took effect.
REDELIVERED_IN_DOUBT_MESSAGE = (
    "This call may or may not have completed: the worker running it stopped and the outcome "
    "could not be confirmed. Do not repeat it; ask the user to check before retrying."
)
#: What the model is told when a worker job's deadline passed with no completion.
JOB_DEADLINE_MESSAGE = (
    "The background job for this call did not finish within its deadline. It may or may "
    "not have taken effect; do not repeat it without checking with the user."
)
#: What the model is told when a tool's ``enqueue`` callable raised.
ENQUEUE_FAILED_MESSAGE = (
    "The tool '{name}' could not be started: its background job could not be queued. "
    "It did not run; you may try again later."
)


def too_large_message(size: int, limit: int) -> str:
    """Model-facing text for an oversized result, so it can ask for less."""
    return (
        f"The tool result was {size} bytes, over the {limit}-byte limit for tool results. "
        "Call the tool again asking for less data (a narrower query, fewer fields or a page)."
    )


def timeout_message(tool_name: str, seconds: float | None) -> str:
    """Model-facing text for a handler that ran out of time."""
    if seconds is None:
        return f"Tool '{tool_name}' timed out."
    return f"Tool '{tool_name}' timed out after {seconds:g} seconds."


def model_error_message(exc: BaseException, *, tool_name: str, timeout: float | None = None) -> str:
    """The text the model sees for a failed call. Only ToolError text is passed through;
    everything the package does not control becomes :data:`INTERNAL_ERROR_MESSAGE`."""
    if isinstance(exc, ToolError):
        return exc.message
    if isinstance(exc, ArgumentValidationError):
        return f"Invalid arguments for {tool_name}: {exc.message}"
    if isinstance(exc, ResultTooLargeError):
        return too_large_message(exc.size, exc.limit)
    if isinstance(exc, ResultEncodingError):
        return (
            f"Tool '{tool_name}' produced a result that could not be sent. "
            "Do not retry with the same arguments unless the user asks."
        )
    if isinstance(exc, TimeoutError):
        return timeout_message(tool_name, timeout)
    return INTERNAL_ERROR_MESSAGE


def error_type_for(exc: BaseException) -> str:
    """A low-cardinality label for metrics and spans (``error.type``)."""
    if isinstance(exc, ToolError):
        return "tool_error"
    if isinstance(exc, ArgumentValidationError):
        return "validation_error"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, ResultTooLargeError):
        return "too_large"
    if isinstance(exc, ResultEncodingError):
        return "encoding_error"
    return "handler_error"


# ---------------------------------------------------------------------------------------------
# Argument validation errors, worded for the model without the submitted values.

_BUILTIN_ERROR_TYPES = frozenset(typing.get_args(ErrorType))
# Context keys pydantic fills from the schema, never from the input.
_SAFE_CTX_KEYS = frozenset(
    {
        "class_name", "gt", "ge", "lt", "le", "multiple_of", "field_type", "min_length",
        "max_length", "actual_length", "expected_plural", "pattern", "expected",
        "discriminator", "expected_tags", "expected_schemes", "expected_version",
        "max_digits", "decimal_places", "whole_digits", "tz_expected", "method_name",
        "class",
    }
)  # fmt: skip
# Fixed texts for error types whose message would quote the input (or a validator's own
# message, which often does).
_VALUE_FREE_MESSAGES = {
    "missing": "Field required",
    "extra_forbidden": "Unexpected field (not in the schema)",
    "value_error": "Value is not valid",
    "assertion_error": "Value is not valid",
    "union_tag_invalid": "Tag does not match any of the expected tags",
    "json_invalid": "Invalid JSON",
    "get_attribute_error": "Error extracting attribute",
    "iteration_error": "Error iterating over the value",
    "mapping_type": "Input should be a valid mapping",
    "bytes_invalid_encoding": "Data is not validly encoded",
    "date_parsing": "Input should be a valid date in the format YYYY-MM-DD",
    "date_from_datetime_parsing": "Input should be a valid date or datetime",
    "time_parsing": "Input should be in a valid time format",
    "datetime_parsing": "Input should be a valid datetime",
    "datetime_object_invalid": "Invalid datetime object",
    "datetime_from_date_parsing": "Input should be a valid datetime or date",
    "timezone_offset": "Wrong timezone offset",
    "time_delta_parsing": "Input should be a valid timedelta",
    "url_parsing": "Input should be a valid URL",
    "url_syntax_violation": "Input violated strict URL syntax rules",
    "uuid_parsing": "Input should be a valid UUID",
    "no_such_attribute": "Object has no such attribute",
}
_SAFE_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
_MAX_LISTED_ERRORS = 10


def validation_error_message(errors: list[Any]) -> str:
    """Render pydantic error dicts as ``path: what was wrong; ...`` without input values.

    Only ``loc``, ``type`` and schema-derived ``ctx`` are read, never ``input``. pydantic's
    own ``msg`` is used only for its built-in error types and when every context value it
    was formatted from comes from the schema; otherwise a fixed text stands in.
    """
    parts: list[str] = []
    for error in errors[:_MAX_LISTED_ERRORS]:
        path = _format_loc(error.get("loc", ()))
        message = _safe_message(error)
        parts.append(f"{path}: {message}" if path else message)
    if len(errors) > _MAX_LISTED_ERRORS:
        parts.append(f"and {len(errors) - _MAX_LISTED_ERRORS} more errors")
    return "; ".join(parts) or "arguments are not valid"


def _safe_message(error: Mapping[str, Any]) -> str:
    kind = str(error.get("type", ""))
    if kind in _VALUE_FREE_MESSAGES:
        return _VALUE_FREE_MESSAGES[kind]
    ctx = error.get("ctx") or {}
    msg = error.get("msg")
    if kind in _BUILTIN_ERROR_TYPES and isinstance(msg, str) and set(ctx) <= _SAFE_CTX_KEYS:
        return msg
    return f"Invalid value ({kind})" if _SAFE_KEY_RE.fullmatch(kind) else "Invalid value"


def _format_loc(loc: object) -> str:
    path = ""
    for part in loc if isinstance(loc, tuple | list) else ():
        if isinstance(part, int):
            path += f"[{part}]"
        elif isinstance(part, str) and _SAFE_KEY_RE.fullmatch(part):
            path += f".{part}" if path else part
        else:
            # Dict keys come from the input too; an odd-looking one is only a placeholder.
            path += "[<key>]"
    return path
